export * from './onnx-graph';
export * from './prng';
export * from './mlp-model';
export * from './tiny-model';
export * from './multi-io-model';
export * from './identity-model';
export * from './demo-models';
