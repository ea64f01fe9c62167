// ManualClock lives beside Clock in libs/clock (as a `.testing` file, which no production build holds),
// so that the specs of the libraries libs/testing depends on (libs/grpc) can move time too; the specs
// of everything else find it here.
export { ManualClock } from '@infermesh/clock/manual-clock.testing';
