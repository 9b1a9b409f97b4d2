"""gpurm am."""

from gpurm.native import extend_path

__path__ = extend_path(__path__, __name__)  # compiled hot modules, when fresh
