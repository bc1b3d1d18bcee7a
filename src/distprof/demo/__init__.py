"""The embedded example job behind ``distprof demo``."""
