"""The hosts' side: read a GPU host and print the install line that fits it (``doctor``), and
one-off requests for a wheel that may not exist yet (``request``)."""
