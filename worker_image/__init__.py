"""spotring worker_image."""
