export * from './service-process';
export * from './system';
export * from './model-registration';
