"""``df.write.format("kafka-changelog")``: rows of entries applied to a stopped application's
state (:mod:`.state_writer`), with their options (:mod:`.options`) and rows (:mod:`.rows`)."""
