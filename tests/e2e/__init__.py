"""End-to-end tests: files that start a job or real Horovod (or torch.distributed) workers,
or hold a test with the ``e2e`` marker."""
