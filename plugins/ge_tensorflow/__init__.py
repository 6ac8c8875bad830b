"""TensorFlow frontends (frozen GraphDef, SavedModel, Keras, tf.function) for GE for Python."""
