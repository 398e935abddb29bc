def test_an_ood_set_from_cifar10s_jpeg_copy_says_so_in_its_row():
    """The mirror's CIFAR-10 is a JPEG copy: "results on it are near, not equal, to results on
    the original CIFAR-10: say so wherever they are shown" (../shared/data/README.md)."""
    from ccu.report import tables
    from ccu.store.records import Metrics

    def metrics(source):
        m = Metrics(test_error=0.01, n_test=10, mean_max_confidence=0.9,
                    ood={"grcifar10": Metrics.ood_entry({"auroc": 0.9}, 0.5)})  # fmt: skip
        m = m.to_json() if hasattr(m, "to_json") else m
        return dict(m, ood_sources={"grcifar10": {"source": source, "label": "GrCIFAR10"}})

    jpeg = tables.ood_table(
        {"Base": metrics("offline mirror cifar10/cifar10-jpeg.tar.gz")}, "mnist"
    )
    assert jpeg.index.tolist() == ["GrCIFAR10 (JPEG copy)"]
    original = tables.ood_table({"Base": metrics("torchvision CIFAR10 files")}, "mnist")
    assert original.index.tolist() == ["GrCIFAR10"]
