"""Glue for libraries that choose a device themselves (Lightning...): imported by the user,
never by torch_pjrt's core."""
