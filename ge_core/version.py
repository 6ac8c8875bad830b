"""The version of ge: the package's, the .om writer's and the command line's."""

__version__ = "0.1.0"
