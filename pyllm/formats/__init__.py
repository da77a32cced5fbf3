"""Model file readers: each mmaps a file, validates its header and yields TensorInfo records."""
from .mapped import MappedFile, TensorInfo

__all__ = ["MappedFile", "TensorInfo"]
