"""The %clamor / %%clamor magics: they parse and delegate, they do not schedule."""
