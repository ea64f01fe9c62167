export * from './request-context';
export * from './json-logger';
export * from './metrics';
