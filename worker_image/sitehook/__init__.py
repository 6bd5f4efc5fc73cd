"""A directory for ``PYTHONPATH`` whose ``sitecustomize`` prepares spotring's workers."""
