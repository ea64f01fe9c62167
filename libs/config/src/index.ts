export * from './env';
export * from './node-version';
