"""``python -m clamor.kernel -f {connection_file}``: start the Clamor kernel (the kernelspec's argv)."""

from clamor.kernel.kernelapp import main

if __name__ == "__main__":
    main()
