"""spotring's controller, on the top floor: it lists and steers the job's groups, and
runs the job.

* the controller's loop (:mod:`~spotring.autoscaler.controller`) and its rooms: the
  groups, their sizes (``steering``, ``capacity``), the published inventory
  (``membership``), failed hosts' replacements, the hosts' notice watchers;
* the job's composition: :mod:`~spotring.autoscaler.composition` (what a job is made
  of, from typed options) and :mod:`~spotring.autoscaler.job` (the run, wired once);
* :mod:`~spotring.autoscaler.cli`: the ``spotring`` command line, which parses and
  reports;
* :mod:`~spotring.autoscaler.observers`: the events file, the metrics, the progress
  lines and the report;
* :mod:`~spotring.autoscaler.plugins` and :mod:`~spotring.autoscaler.hookspecs`: the
  plugin machinery and every hook.

Plugin authors import from :mod:`spotring.plugin`; ``hookimpl`` is here too, where
plugins have always imported it.
"""

from spotring.core.hooks import hookimpl

__all__ = ["hookimpl"]
