"""Dataset sources, partitioners and per-client tensors."""

from .federated import ClientData, FederatedData, build_federated_data, load_data
from .partition import PARTITIONS, ClientSplit, partition
from .catalog import SOURCES, input_shape_of, load_source, source_domains
from .sources import DataError, Dataset

__all__ = [
    "SOURCES", "PARTITIONS", "DataError", "Dataset", "load_source", "input_shape_of", "source_domains",
    "ClientSplit", "partition", "ClientData", "FederatedData", "build_federated_data", "load_data",
]
