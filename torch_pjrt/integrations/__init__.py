"""Glue between torch-pjrt and other libraries, on top of every layer (the core imports none
of it): each module is one library's way to take a third-party device."""
