"""Context memory: tables the NIC keeps in host memory (ICM) and caches on chip."""
