export * from './request-context';
export * from './json-logger';
export * from './metrics';
export { delayBeyondResolutionSeconds } from './event-loop-delay';
export * from './model-labels';
export * from './trace-ids';
export * from './tracing';
