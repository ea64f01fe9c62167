export * from './runtime.module';
export * from './bootstrap';
export * from './runtime-config';
export * from './lookup-memo';
export * from './health-details';
export * from './monitoring-server';
export * from './mesh-xds';
