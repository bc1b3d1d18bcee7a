"""What to capture: settings, validated once, loadable from anywhere.

- :mod:`.model`: ``ProfilerConfig`` (every field documented), the engine setting in :mod:`.engine`;
- :mod:`.errors`: how a config problem reads (``ConfigError``, one line per problem);
- :mod:`.limits`: how big a config's parts may be, how a path setting must look;
- :mod:`.args`: command-line flags (argparse, ``HfArgumentParser``);
- :mod:`.plan`: which global steps, ranks and roles capture (pure; no torch);
- :mod:`.mesh`: ranks as coordinates of a device mesh;
- :mod:`.dialects`: other frameworks' profiler configs translated to distprof's.

``distprof.ProfilerConfig`` is the public name; this package re-exports nothing, so that reading a plan does not
import pydantic.
"""

from distprof.config.errors import ConfigError, ConfigProblem

__all__ = ["ConfigError", "ConfigProblem"]
