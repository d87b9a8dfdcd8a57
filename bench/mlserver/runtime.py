"""MLServer custom runtime: an ONNX model on onnxruntime (CPU), the Python
KServe v2 server a team would deploy instead of kiln. Used by make bench
(bench/mlserver.sh), with MLServer's adaptive batching on: requests arrive
here already concatenated along the first dimension."""
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

# ONNX tensor element types onnxruntime reports -> numpy, for casting JSON data
# (which arrives as Python numbers) to what the session expects.
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(bool)": np.bool_,
}


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        # The uri in model-settings.json is resolved relative to that file.
        path = await get_model_uri(self.settings)
        extra = (self.settings.parameters.extra or {}) if self.settings.parameters else {}
        opts = ort.SessionOptions()
        # 0 = onnxruntime's default (one thread per physical core).
        opts.intra_op_num_threads = int(extra.get("threads", 0))
        self.sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input_types = {i.name: _ORT_TYPES.get(i.type, np.float32) for i in self.sess.get_inputs()}
        self.output_names = [o.name for o in self.sess.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {}
        for inp in payload.inputs:
            if inp.name not in self.input_types:
                raise ValueError(f"unknown input '{inp.name}' (the model has {sorted(self.input_types)})")
            feeds[inp.name] = NumpyCodec.decode_input(inp).astype(self.input_types[inp.name], copy=False)
        outs = self.sess.run(self.output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(name=n, payload=o) for n, o in zip(self.output_names, outs)],
        )
