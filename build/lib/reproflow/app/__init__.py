"""The application: the command line and `reproflow reproduce`."""
