export * from './request-context';
export * from './json-logger';
export * from './metrics';
export * from './model-labels';
export * from './trace-ids';
export * from './tracing';
