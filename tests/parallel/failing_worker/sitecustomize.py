"""Put on PYTHONPATH by test_launch.py: in a spawned worker (rank >= 1), loading the rank's model fails as a corrupt
shard would; rank 0, the test process itself, started before this was on the path and loads normally."""
import importlib.abc, importlib.util, sys

class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "inferlab.parallel.worker": return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            def corrupt(path, parallel, rank, *args, **kwargs):
                raise ValueError(f"{path}/model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' could not be "
                                 "read (incomplete file: rank 1's copy is truncated)")
            module.load_rank_model = corrupt
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Patch())
