"""The directory the node agent puts on a new-interpreter rank's PYTHONPATH (its ``sitecustomize``)."""
