export * from './atomic-file';
