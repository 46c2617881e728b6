"""Where a model file came from: training records (``record``), signatures and SLSA
attestations (``signing``), lineage chains (``lineage``) and CycloneDX / model-card exports (``exports``)."""
