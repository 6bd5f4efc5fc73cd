"""Unit tests: one module or a few, in process or with short-lived helper processes; no
cloud API (not even a fake), no job."""
