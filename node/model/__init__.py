"""The model a path is: the muP transformer, the router that sends documents to paths, and the data."""
