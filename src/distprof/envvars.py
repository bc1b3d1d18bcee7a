"""The environment variables that are distprof's own, in one place.

Every ``DISTPROF_<FIELD>`` variable is a config setting (see ``config.env_overrides``); the names here share the
prefix but are not settings. A config refuses an unknown ``DISTPROF_*`` variable as a likely typo, so each
variable distprof itself sets or reads must be listed here, or a process distprof started would refuse its own
environment.
"""

PREFIX = "DISTPROF_"

# Set by ``distprof.wrap`` in a worker it runs under a profiling tool: "<backend>:<wrapper pid>".
WRAPPED_BY = "DISTPROF_WRAPPED_BY"
# Reserved for distprof's log level, so a user who sets it is never told it is a typo.
LOG_LEVEL = "DISTPROF_LOG_LEVEL"

NOT_SETTINGS = frozenset({WRAPPED_BY, LOG_LEVEL})
