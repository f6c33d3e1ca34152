"""Reporting: tables and figures from the rows, claims with intervals, the report page."""
