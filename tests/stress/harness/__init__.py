"""The stress harness (tests only, never installed): seeded data, sweeps and fuzzers that drive the real loader.

``tests/conftest.py`` puts ``tests/stress`` on ``sys.path``, so tests import ``harness.<module>``;
``tests/stress/report.py`` runs every part and prints the reliability table.

- :mod:`harness.data`: a tiny Energon dataset and task encoder (microseconds per sample).
- :mod:`harness.loaders`: the sweeps' loader, its shutdown, bit-exact batch comparison, state copies.
- :mod:`harness.watchdog`: an alarm that turns a blocked call into a counted hang.
- :mod:`harness.resume`, :mod:`harness.topology`, :mod:`harness.coverage`: resume and epoch sweeps.
- :mod:`harness.fuzz`, :mod:`harness.convert_fuzz`: hostile input through the loader and through ``convert``.
- :mod:`harness.memory`, :mod:`harness.video_memory`: peak worker RSS against a stated bound.
"""
