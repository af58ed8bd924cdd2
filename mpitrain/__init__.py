"""mpitrain: Spark ETL to HDF5 shards, then data-parallel training over MPI."""

__version__ = "0.1.0"
