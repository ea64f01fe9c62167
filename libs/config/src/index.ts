export * from './env';
export * from './node-version';
export * from './tracing-env';
export * from './heap';
