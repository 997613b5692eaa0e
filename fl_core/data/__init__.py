"""Dataset sources, partitioners and per-client tensors (see DESIGN.md, "Data")."""

from .federated import ClientData, FederatedData, build_federated_data, load_data
from .partition import PARTITIONS, ClientSplit, partition
from .sources import SOURCES, DataError, Dataset, input_shape_of, load_source

__all__ = [
    "SOURCES", "PARTITIONS", "DataError", "Dataset", "load_source", "input_shape_of",
    "ClientSplit", "partition", "ClientData", "FederatedData", "build_federated_data", "load_data",
]
