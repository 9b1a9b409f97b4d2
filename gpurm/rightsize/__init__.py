"""Phase-based right-sizing (AI4DL-style): container usage series, phase discovery, reservation policies."""
