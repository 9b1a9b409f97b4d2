"""The RM's HTTP face: a REST API under /api/v1 and a small server-rendered web UI, served by aiohttp in the RM's
own event loop (docs/http.md). `server.py` builds and runs it, `auth.py` says who asks, `api.py` holds the REST
routes, `jsonview.py` the JSON shape, `openapi.py` the OpenAPI document, `pages.py` the HTML pages, `static/` the
stylesheet and script."""
