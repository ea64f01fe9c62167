export * from './datatypes';
export * from './shape';
export * from './bytes-elements';
export * from './json-data';
export * from './half-float';
export * from './signature-check';
export * from './cache-key';
export * from './parameters';
