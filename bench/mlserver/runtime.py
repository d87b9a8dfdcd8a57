"""MLServer custom runtime: an ONNX model on onnxruntime (CPU), the Python
KServe v2 server a team would deploy instead of kiln. Used by make bench."""
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        path = self.settings.parameters.uri
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(self.settings.parameters.extra.get("threads", 0)) if self.settings.parameters.extra else 0
        self.sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.sess.get_inputs()]
        self.output_names = [o.name for o in self.sess.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {}
        for inp in payload.inputs:
            feeds[inp.name] = NumpyCodec.decode_input(inp).astype(np.float32, copy=False)
        outs = self.sess.run(self.output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(name=n, payload=o) for n, o in zip(self.output_names, outs)],
        )
