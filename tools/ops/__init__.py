"""Operations: `soak.py` (`make soak`), `faults.py` (`make faults`), `install_torch.py` (the
CPU torch `make` installs first; run as a script, standard library only)."""
