"""Several runs guarded by one guardian process (``guardian fleet``)."""
