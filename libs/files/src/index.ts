export * from './atomic-file';
export * from './json-file';
