"""The scheduling policies: the pass, job priority, in-queue and fair-share preemption, reclaim, Gittins, elastic
growth, AM pacing. Pure."""
