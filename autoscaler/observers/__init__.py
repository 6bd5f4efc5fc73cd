"""What a run tells its user: plugins that hear the job's events through the same hooks
a third-party plugin would, and the report drawn from them afterwards.

* :mod:`~spotring.autoscaler.observers.events`: ``--events FILE``, one JSON object per
  line (:class:`EventLog`), and :data:`EVENTS`, every event and field it writes;
* :mod:`~spotring.autoscaler.observers.metrics`: ``--metrics-port``, the run's
  Prometheus series (:func:`run_series`) and their server (:class:`Metrics`);
* :mod:`~spotring.autoscaler.observers.progress`: the progress lines and the closing
  summary on stderr (:class:`ProgressReporter`);
* :mod:`~spotring.autoscaler.observers.report`: ``spotring report FILE``, an events
  file drawn as one page.

Each is imported from its own module (a run loads only the observers it asks for).
"""
