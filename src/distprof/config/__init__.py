"""What to capture: settings, validated once, loadable from anywhere.

- :mod:`.model`: ``ProfilerConfig`` (every field documented) and its loading classmethods;
- :mod:`.options`: its option sections (schedule, torch, cuda_memory, nsys, rocprof_sys, py_spy, memray); the
  engine setting in :mod:`.engine`;
- :mod:`.validation`: the strict base model and the value parsers (steps, ranks, role names);
- :mod:`.load`: the one loader (YAML / JSON / TOML files, OmegaConf objects), bounded; :mod:`.env`: the
  ``DISTPROF_*`` overrides;
- :mod:`.errors`: how a config problem reads (``ConfigError``, one line per problem);
- :mod:`.limits`: how big a config's parts may be, how a path setting must look; :mod:`.names`: the backends
  and activities a config chooses from;
- :mod:`.args`: command-line flags (argparse, ``HfArgumentParser``);
- :mod:`.plan`: which global steps, ranks and roles capture (pure; no torch);
- :mod:`.mesh`: ranks as coordinates of a device mesh;
- :mod:`.dialects`: other frameworks' profiler configs translated to distprof's (given the config class by the
  caller: they never import the model).

Imports point down: names, limits, errors, plan, mesh < load < validation < options < env < dialects < model;
args (flags) sits below the model, which reads them.

``distprof.ProfilerConfig`` is the public name; this package re-exports nothing, so that reading a plan does not
import pydantic.
"""

from distprof.config.errors import ConfigError, ConfigProblem

__all__ = ["ConfigError", "ConfigProblem"]
