"""The commands of the ``servemon`` console script, one module per command or group.

- :mod:`~servemon.commands.options`: every option more than one command takes.
- :mod:`~servemon.commands.sim`: ``sim``; :mod:`~servemon.commands.exporter`:
  ``exporter``; :mod:`~servemon.commands.load`: ``ramp``, ``sweep``, ``capacity``,
  ``replay``, ``control``; :mod:`~servemon.commands.fleet`: ``worker`` (and the
  fleet options of the load commands); :mod:`~servemon.commands.runs`: ``report``,
  ``compare``, ``merge``; :mod:`~servemon.commands.plan`: ``plan``;
  :mod:`~servemon.commands.autoscale`: ``autoscale``;
  :mod:`~servemon.commands.trace`: ``trace synth``, ``trace info``;
  :mod:`~servemon.commands.generate`: ``dashboards``, ``rules``;
  :mod:`~servemon.commands.demo`: ``demo``.

A command raises :class:`servemon.core.errors.ServemonError` for anything a user can
fix; :class:`servemon.cli.ServemonGroup` turns it into one line and exit status 2.
"""

__all__: list[str] = []
