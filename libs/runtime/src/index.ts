export * from './runtime.module';
export * from './bootstrap';
export * from './runtime-config';
export * from './lookup-memo';
