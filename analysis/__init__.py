"""The papers' tables, figures and claims, one module per family (`analysis.<family>`), installed with
reproflow and imported by name by its report (`reproflow report`)."""
