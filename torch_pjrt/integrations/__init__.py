"""Glue between torch-pjrt and other libraries (Hugging Face, Lightning...), on top of every
layer: each module is one library's way to take a third-party device. The core imports none
of it; the package's import installs only the Trainer's import hook."""
