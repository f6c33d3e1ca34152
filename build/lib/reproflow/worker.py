"""`python -m reproflow.worker`: a rank's entry point, the name sbatch scripts and launchers call.

The rank's work (read the suite, load the family, run each point, write its rows) is in
reproflow.rank.worker; this name stays so that scripts rendered earlier keep working.
"""

from reproflow.rank.worker import entry

if __name__ == "__main__":
    entry()
