"""txstream: transactional stream processing on Ray."""
