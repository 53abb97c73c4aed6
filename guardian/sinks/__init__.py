"""Where the guardian's state goes besides the store: exporters and notifiers."""
