import { buildClassifierModel } from './classifier-model';
import { buildIdentityModel } from './identity-model';
import { buildMlpModel } from './mlp-model';
import { buildMultiIoModel } from './multi-io-model';
import type { BuiltModel } from './onnx-graph';
import { buildTinyModel } from './tiny-model';

/** The demo models by the name they are registered under. */
export const DEMO_MODELS: Readonly<Record<string, () => BuiltModel>> = {
  mlp: () => buildMlpModel(),
  tiny: buildTinyModel,
  'multi-io': buildMultiIoModel,
  identity: () => buildIdentityModel(),
  classifier: buildClassifierModel,
};
