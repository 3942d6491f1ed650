"""Launching and supervising local workers: the library under ``scaledl train --ranks N``,
``scaledl bench`` and ``scaledl run``.

- :mod:`~scaledl.launch.policy`: what a failure does (:class:`FaultPolicy`), how a job ended
  (:class:`JobOutcome`), and the settings every launcher here shares;
- :mod:`~scaledl.launch.shared_agent`: one torch elastic agent for all workers (stop all, restart);
- :mod:`~scaledl.launch.agents`: one agent per worker (drop a dead worker, go on with fewer),
  each :mod:`~scaledl.launch.agent_main`;
- :mod:`~scaledl.launch.local`: a command's workers here, or the command itself under a
  launcher (:func:`run_distributed`);
- :mod:`~scaledl.launch.exec_rank`: how ``scaledl run`` starts each rank of any command.
"""
